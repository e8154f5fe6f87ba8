# The hash of core's sources the compiled modules beside it were built from (hatch_build.py passes it):
# ``core`` runs them only when it matches the sources there (``sources.source_hash``).
SOURCE_HASH = CORE_SOURCE_HASH
