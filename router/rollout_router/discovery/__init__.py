"""Where replicas come from: a static list (settings.backends) or a Kubernetes pod watch.

``kubernetes`` follows pods through ``rollout_router.kube`` (the cluster access
shared with the operator), which loads the Kubernetes client only when
discovery starts, so a router with a static list never loads it.
"""
