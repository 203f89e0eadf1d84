"""Running a training: the loop, its checkpoints, stops, locks and logs; what a method declares."""
