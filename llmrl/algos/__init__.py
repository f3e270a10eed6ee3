"""Update rules, one readable file each."""
