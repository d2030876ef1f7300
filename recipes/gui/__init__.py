"""GUI recipe: click, type, scroll, go-back and open-app instructions on screenshots, scored by the
``gui_action`` reward (docs/rewards.md#domain-rewards). ``data`` generates rendered screens with measured element boxes;
``convert`` turns ScreenSpot and AndroidControl/GUI-R1 step records into the same record format."""
