"""Generation methods: one module each, registered by name (`registry`), built on `base.Method`."""
