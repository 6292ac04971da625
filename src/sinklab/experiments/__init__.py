"""Recipes that combine the library parts into the paper's experiments."""
