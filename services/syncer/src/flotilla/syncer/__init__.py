"""Flotilla syncer."""
