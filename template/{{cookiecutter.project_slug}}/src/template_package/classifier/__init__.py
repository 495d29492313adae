"""The example task: an image classifier on scikit-learn's digits (or an ImageFolder tree). Yours to replace: see the
README, "Your own model and data"."""
