"""Cloud maintenance events: the providers' scheduled-event documents, and the check."""
