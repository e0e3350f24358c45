"""A worker's start as a user meets it: process start to the first result."""
