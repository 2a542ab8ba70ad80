"""Reading what users give: specs, the whitelist expression parser, matrices, user text, limits."""
