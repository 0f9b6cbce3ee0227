"""Flotilla kubesim."""
