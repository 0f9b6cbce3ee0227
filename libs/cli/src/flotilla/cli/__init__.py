"""The ``flotilla`` command: how a person meets Flotilla.

It starts a whole installation on one machine (`flotilla.cli.environment`), talks
to its hub and bus (`flotilla.cli.hub`, `flotilla.cli.bus`), replays recorded
decisions through a service's pure core (`flotilla.cli.replay`) and plays the
drain demo (`flotilla.cli.demo`). It is a client, not a service: it may import a
service's pure core, and no service ever imports it.
"""
