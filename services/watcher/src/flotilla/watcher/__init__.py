"""Flotilla watcher."""
