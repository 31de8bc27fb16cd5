"""Runs read back and set side by side: the end-of-sweep summary, reports, compare, export; one typed row each."""
