"""Cluster access shared by pod discovery (the router) and the operator.

One module per job: ``credentials`` (in-cluster service account, else
KUBECONFIG), ``client`` (authenticated JSON requests and streams on aiohttp),
``resources`` (plurals and paths from the API's discovery documents),
``objects`` (server-side apply, delete, list), ``watching`` (list, then watch
with resume and re-list on 410), ``selectors`` and ``pods`` (pure helpers).
Only ``credentials`` touches the ``kubernetes`` package, and only when called,
so a router with a static backend list never imports it.
"""
