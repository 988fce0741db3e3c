"""The local sandbox provider."""
