"""Datasets: recording experience as Minari datasets and warm-starting learners from them."""
