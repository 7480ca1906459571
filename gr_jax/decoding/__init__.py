"""The `decoding` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: beam_search (any constraint, score modes, bonus and project hooks, history of every level, runs of
levels in a `lax.scan`; beam_search_flat: a constraint giving each level's candidates flat), exhaustive (oracle,
search error), rankers (FirstOccurrence and its traced twin first_occurrence_ranked, flat_slots/group_starts for
methods' rankers, order)
"""
