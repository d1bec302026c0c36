"""tether runner: the light daemon on a borrowed server."""
