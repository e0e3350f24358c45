"""open_nsfw: Yahoo's NSFW image classifier, scoring the label ``nsfw`` (and ``sfw``)."""
