"""Process plumbing behind the DataLoader's iterators: workers, their wire, teardown."""
