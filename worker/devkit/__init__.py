"""worker/devkit."""
