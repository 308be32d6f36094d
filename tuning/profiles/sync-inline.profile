# sync-inline: where the journal's fdatasync runs, one engine knob: on the core itself (it waits for the disk).
DESCRIPTION="sync_via = inline"
ENGINE_TOML='sync_via = "inline"'
