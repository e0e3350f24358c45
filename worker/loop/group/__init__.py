"""The member's place in its consumer group: the partitions it owns and their epochs, the
rebalance callbacks, and what keeps a member in its group (a lost consumer replaced, orphaned
partitions taken back, a fenced static member rejoining)."""
