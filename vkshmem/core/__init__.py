"""vkshmem core: config, errors, bootstrap, heap, transports, plugins, runtime."""
