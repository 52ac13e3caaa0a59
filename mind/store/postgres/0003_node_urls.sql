
    ALTER TABLE nodes ADD COLUMN url TEXT;
    