"""flora.export: LeRobot v3.0 export carrying the engine's annotations."""
