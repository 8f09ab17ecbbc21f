"""A ZeroMQ echo service for the bus product: the worked example of docs/extending.md."""
