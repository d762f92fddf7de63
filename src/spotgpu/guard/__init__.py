"""The return guard: holds an owner's first GPU call (seccomp user notification) until spot work is gone."""
