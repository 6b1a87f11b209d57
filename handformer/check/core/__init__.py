"""The grader's engine: finding and building a learner's components, calling them in a sandbox,
the search that names a mistake, localizing what has no name, and the report."""
