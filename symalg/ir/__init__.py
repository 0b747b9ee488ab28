"""The graph format every front end emits and every later stage reads."""
