"""Flotilla depdetector."""
