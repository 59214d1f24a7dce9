"""Errors and order-stable numerics shared by every layer."""
