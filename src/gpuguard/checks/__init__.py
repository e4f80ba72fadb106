"""One module per signal source; see ``registry`` for the list the runner uses."""
