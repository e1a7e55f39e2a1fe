"""Test data and tools, kept out of the runtime layers: hand-checkable synthetic Programs
(`programs`), synthetic Reports (`synthetic`: generated, never results) and the
profile-file fuzzer (`fuzz`). Tests, benches and notebooks import them; no runtime module
does."""
