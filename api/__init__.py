"""specscribe service edge: HTTP API and the command line."""
