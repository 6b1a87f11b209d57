"""One runner a kind of component: build the learner's component, drive it, compare it with the
reference, name the mistake."""
