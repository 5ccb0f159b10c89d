"""sage-tfx privacy core."""
