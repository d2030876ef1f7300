"""GUI agent recipe: multi-step tasks in generated web apps (settings, form, list, shop, mail; and ``panel``, coloured
tiles to press in order, for the tiny model, which sees colour and layout but cannot read) run in sandboxed Chromium
by the ``browser_app`` env (issue 20's browser world, :mod:`mmrl.envs.browser`). ``apps`` generates the apps and
their tasks with oracles, ``data`` builds the records."""
