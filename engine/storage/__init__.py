"""Where folders live: a local path or object storage (``s3://``, ``gs://``), below the data and
results layers that both read through it. ``engine.results`` is its public face."""
