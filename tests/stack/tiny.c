/* The test stack's "extension": a library the server maps, so provenance can find it. */
int tiny_version(void) { return 7; }
