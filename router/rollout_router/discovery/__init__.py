"""Where replicas come from: a static list (settings.backends) or a Kubernetes pod watch.

``selectors`` is pure and shared with the operator; ``kubernetes`` imports the
Kubernetes client lazily, so a router with a static list never loads it.
"""
