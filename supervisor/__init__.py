"""tether supervisor: the owned box that holds the record."""
