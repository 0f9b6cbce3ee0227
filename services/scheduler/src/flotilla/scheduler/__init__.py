"""Flotilla scheduler."""
