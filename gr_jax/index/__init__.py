"""The `index` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: constraint (what the beam search asks of a decoding constraint), trie (TrieIndex: build, lookup,
insert, compact, save/load), device (DeviceTrie, its runs of levels, leaf payload), substring (SubstringIndex:
suffix- array segments over documents' tokens, any n-gram of any document; DeviceSubstrings on the device)
"""
