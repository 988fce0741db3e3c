"""Screens: the run screen (live and replay), the runs browser, modals, help and the shell."""
