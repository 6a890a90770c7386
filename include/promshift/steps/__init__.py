"""What a migration does, framework-free: deploy, warm-up, gate, cut-over, rollback, moves, lifecycle."""
