"""The encoder-decoder backbones a retriever can be built on, by their config type: T5 and BART.

Both networks have the same methods (`encode`, `decode`, `logits`, `token_logits`, `init_cache`,
`decode_step`, …) and the same decode cache (`t5.DecodeCache`), so a retriever, a docid head or a search calls
them by method name and never asks which one it holds. What differs is read here:

  network(config, scan_layers)   the Flax module;
  init_params(config, seed)      random parameters;
  param_axes(config)             logical sharding axes;
  search_params(network, params) the parameters as a search's steps read them (a scanning T5 stacks its layers
                                 once per search);
  config_from_dict(d)            a config recorded as JSON (`to_json`; BART's carries "architecture": "bart").

A gin file picks the backbone with `prepare.network = @t5.get_config()` or `@bart.get_config()`.
"""

from __future__ import annotations

from typing import Any, Union

from gr_jax.backbones import bart, t5

Config = Union[t5.T5Config, bart.BartConfig]
CONFIG_TYPES = (t5.T5Config, bart.BartConfig)


def is_config(config: Any) -> bool:
    return isinstance(config, CONFIG_TYPES)


def network(config: Config, scan_layers: bool = False):
    if isinstance(config, bart.BartConfig):
        return bart.Bart(config)
    return t5.T5(config, scan_layers=scan_layers)


def init_params(config: Config, seed: int = 0) -> dict:
    if isinstance(config, bart.BartConfig):
        return bart.init_params(config, seed=seed)
    return t5.init_params(config, seed=seed)


def param_axes(config: Config) -> Any:
    if isinstance(config, bart.BartConfig):
        return bart.param_axes(config)
    return t5.param_axes(config)


def search_params(net, params: dict) -> dict:
    """The network parameters as a search's steps read them (a scanning T5: layers stacked once)."""
    if isinstance(net, t5.T5) and net.scan_layers:
        return t5.with_stacked_layers(params, net.config)
    return params


def config_from_dict(d: dict) -> Config:
    if d.get("architecture") == bart.ARCHITECTURE:
        return bart.BartConfig.from_dict(d)
    return t5.T5Config.from_dict(d)
