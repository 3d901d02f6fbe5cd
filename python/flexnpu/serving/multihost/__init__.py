"""Serving across hosts: one engine replica per host that offers FlexNPU devices (Ray actors,
`ray_replicas`), one front with the Engine's API routing to them (`front`), one /metrics with
a `host` label (`cluster_metrics`). Ray is imported only by `ray_replicas`, when used."""
