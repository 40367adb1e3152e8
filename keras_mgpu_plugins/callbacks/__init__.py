"""Callbacks: drop-ins for what users pass to model.fit, safe with several devices."""
