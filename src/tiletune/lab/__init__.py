"""Tools for the people who design spaces and study strategies, not the user's runtime path: A/B
validation, shrinking a space, suggestions, the catalogue, strategy evaluation, table filling,
campaigns, recordings, examples and the demo. Nothing in the core imports this package."""
