"""make versions: what the project pins, when each release was made, when its support ends; a room a fork can delete."""
