"""The domain proxy: peers' transfers on a domain's memory that no transport carries, served
by a thread of the owning PE (the protocol in :mod:`.protocol`, the mailbox in :mod:`.mailbox`,
the serving side in :mod:`.serve`, the device side in :mod:`.device`, the native rounds in
:mod:`.native`)."""
