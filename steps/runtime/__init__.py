"""Runtime recipes: what a GPU cluster should run, rendered for GitOps, compared with what it runs.

Modules: :mod:`criteria` (what a recipe is for), :mod:`catalogue` (loading ``recipes/``),
:mod:`resolve` (overlays merged into a RecipeResult), :mod:`graph` (dependency order), :mod:`bundle`
(Helm, Argo CD and Flux bundles), :mod:`snapshot` and :mod:`drift` (the live cluster against the recipe).
"""

__all__: list[str] = []
