"""The keyed-state runtime every stateful pattern runs through (:mod:`app.runtime.keyed`)."""
