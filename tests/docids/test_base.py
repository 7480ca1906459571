"""scheme_params: the record of a scheme's parameters that a saved state was built from."""

def test_a_parameter_added_later_is_left_out_of_the_record_at_its_default():
    """States saved before a scheme grew a parameter still match while the new parameter keeps its default."""
    import dataclasses

    from gr_jax.docids.base import added_field, scheme_params

    @dataclasses.dataclass
    class Old:
        size: int = 3

    @dataclasses.dataclass
    class New:
        size: int = 3
        units: object = added_field(None)
        cap: int = added_field(24)

    assert scheme_params(New()) == scheme_params(Old()) == {"size": 3}
    assert scheme_params(New(units="sentence")) == {"size": 3, "units": "sentence"}
    assert scheme_params(New(cap=48)) == {"size": 3, "cap": 48}
