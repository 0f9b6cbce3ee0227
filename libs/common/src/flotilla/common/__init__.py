"""Flotilla common."""
