"""kubesim: an in-process Kubernetes API server and KWOK-style cluster simulator.

`server.KubeSim` is one cluster (or, with `hub=True`, a bare API server); `store.Store`
is the in-memory object store both the HTTP layer and the simulator (`sim/`) use;
`testing` is the pytest plugin; `python -m flotilla.kubesim` / `flotilla-kubesim` runs
one cluster as a process. Flotilla services never import this package: they talk to
kubesim through kubernetes_asyncio exactly as they talk to a real cluster.
"""
