"""What a run tells: progress, the printed lines, rates, and the summary."""
